#!/bin/bash
# The GPU checks of issue 40 in one call of the device tool (about 7 minutes on an H200):
#   run(command="bash benchmarks/gpu_check.sh", carry=[".whl"], timeout_s=540)
# Before it, once, here (the GPU machine has no OR-tools, which `import xla_dtensor` needs):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl ortools==9.15.6755 immutabledict==4.3.1 protobuf==6.33.6
# What it does there: builds the recorder's C extension for that Python, runs the lazy rows of
# benchmarks/accelerator_step.py (torch eager, lazy: launched in phases at backward() and whole, lazy with the
# Python recorder; GPT and HF GPT-2, float32; RUNNERS=... picks others) and, unless CPU_TABLE=0,
# lazy_overhead.py on that machine's CPU. Results land in $OUT (the tool brings them back).
export PYTHONUNBUFFERED=1
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
fi
OUT=${OUT:-/tmp/gpu_check}; mkdir -p "$OUT"
nvidia-smi -L; python3 -V
python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1 || { tail -5 "$OUT/build.log"; exit 1; }
python3 -c "from xla_dtensor.core import native; print('C recorder:', native.ON, native.REASON)"
python3 -c "from xla_dtensor.spmd.sharded_tensor import subclass_dispatch_works as ok; print('sharding on this torch:', ok())"
timeout 310 python3 benchmarks/accelerator_step.py --sizes medium --models gpt,hf-gpt2 --dtypes float32 \
  --runners ${RUNNERS:-torch-eager,lazy,lazy-whole,lazy-python} --timeout 100 --budget 300 --out "$OUT" 2>&1 | grep -v Warning
[ "${CPU_TABLE:-1}" = 0 ] && exit 0
JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=8 CUDA_VISIBLE_DEVICES= \
  timeout 150 python3 benchmarks/lazy_overhead.py --rounds 1 --no-save 2>&1 | tee "$OUT/lazy_overhead.txt" | tail -40
