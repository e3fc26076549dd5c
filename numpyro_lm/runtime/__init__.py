"""How programs run: the jit service (arrays vs static arguments, one compile cache, vmap over
a batch, ``shard_map`` over devices), the batch's axes and padding, data kept static, draws
from JAX keys, progress bars and the XLA:CPU flag.

Imports nothing else of the package: every other stage may import it.
"""
