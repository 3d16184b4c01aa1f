"""Test configuration: float64 and strict dtype promotion, as for every accuracy claim ukjax makes."""

import jax

jax.config.update("jax_enable_x64", True)
jax.config.update("jax_numpy_dtype_promotion", "strict")
