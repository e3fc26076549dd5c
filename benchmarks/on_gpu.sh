#!/usr/bin/env bash
# The GPU rows of benchmarks/placement.py, benchmarks/inla.py and benchmarks/scale.py, on a lent GPU machine
# (../shared/GPU.md: its python has jax and numpyro; numpyro_lm runs from the checkout).
# Run from the repository's root there; the tables and logs are copied to $OUT where it is set.
# Each benchmark has a time limit (seconds: PLACEMENT_SECONDS, INLA_SECONDS, SCALE_SECONDS) so that one
# lease holds both; a benchmark cut short still leaves the rows it printed in its log.
# Here, afterwards: `python benchmarks/report.py inla_gpu scale.md` (and scale_gpu; placement_gpu scaling.md) puts
# the fetched tables into docs/scale.md. INLA_NUTS_MAX=5000 keeps NUTS to the smallest size.
set -u
export PYTHONPATH=$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false
out=${OUT:-/tmp}
python3 -c "import jax, numpyro; print('jax', jax.__version__, 'numpyro', numpyro.__version__, jax.devices())"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for bench in placement inla scale; do
    case $bench in placement) limit=${PLACEMENT_SECONDS:-150};; inla) limit=${INLA_SECONDS:-300};; *) limit=${SCALE_SECONDS:-270};; esac
    timeout "$limit" python3 benchmarks/$bench.py 2>&1 | tee "$out/${bench}_gpu.log"
    pkill -f "benchmarks/$bench.py" || true  # the per-size processes a cut-short run leaves
    cp "benchmarks/results/${bench}_gpu.md" "$out/" 2>/dev/null || echo "no ${bench}_gpu.md: cut short?"
done
