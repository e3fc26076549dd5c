export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
timeout 100 python3 gpu_check.py 2>&1 | grep -v Warning
JAX_DEFAULT_MATMUL_PRECISION=highest timeout 100 python3 gpu_check.py 2>&1 | grep -v Warning
