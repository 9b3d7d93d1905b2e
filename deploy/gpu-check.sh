#!/usr/bin/env bash
# Runs the GPU checks from a bundle made by deploy/gpu-bundle.sh, on a GPU
# machine, from the repository root: the gpu-labelled tests (the same
# binaries `ctest -L gpu` runs), `zo-bench gpu` in bf16 and fp16, the PyTorch
# peer step (bench/torch_twin/gpt2_gpu_step.py, when python3 has torch) and
# a short zo-train run on the GPU. Logs and JSON rows go to $OUT (default
# ./gpu-check-out). PARTS picks what runs, in this order (default: all but
# largest and anchors): ops stage ipc bench twin train e2e gpt2 accum pytest
# hfgpt2 memcheck stream anchors largest. pytest (zo.torch's tests with parameters on
# the GPU) and hfgpt2 (zo.torch on a Hugging Face GPT-2 small beside
# torch.optim.AdamW) need .devbin/python.tar.xz from
# deploy/gpu-python-bundle.sh; anchors (DeepSpeed's ZeRO-2 CPU offload beside
# zo.torch, bench/anchors/) also wheels of deepspeed and what it needs
# that the machine lacks in .whl/ (bench/anchors/README.md).
# `largest` is zo-bench gpu's gpu_largest row: a 4.1B GPT with its server
# in this process, minutes and ~100 GB of host RAM. BENCH_DTYPES (default
# "bf16 fp16") and OPS_FILTER (a gtest filter) narrow bench and ops;
# LARGEST_FLAGS adds zo-bench flags to the largest run (LARGEST_TAG names its log):
# ZeRO-Infinity's shape is LARGEST_FLAGS="--largest 48x4096x32
# --largest-device-memory-budget 60GiB --largest-nvme /some/dir".
# `stream` is zo-bench stream on the GPU: a quarter of the weights on the
# device, streamed from the servers' copy and then from a file, against all
# of them resident (issue 38's <= 1.15).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-$PWD/gpu-check-out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
for packed in .devbin/*.tar.xz; do tar -C .devbin -xJf "$packed"; done
# cuBLASLt 13: the CUDA toolkit's, else the one PyTorch's wheels carry.
ltdir=$(dirname "$(find /usr/local/cuda/lib64 /usr/local/cuda*/ /opt /usr/lib \
  -name 'libcublasLt.so.13*' 2>/dev/null | head -1)")
# NCCL (loaded at run time, for device links): the toolkit's or PyTorch's.
nccldir=$(dirname "$(find /usr/local/cuda*/ /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH=$PWD/.devbin/lib:$ltdir:$nccldir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
echo "gpu-check: cuBLASLt from $ltdir, NCCL from $nccldir"
status=0
parts=" ${PARTS:-ops stage ipc bench twin train e2e gpt2 accum pytest hfgpt2 memcheck stream} "
want() { [[ $parts == *" $1 "* ]]; }
step() {  # name, timeout, command...
  local name=$1 limit=$2; shift 2
  echo "== $name"
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  tail -n 25 "$out/$name.log"
  echo "== $name: rc $rc"
  [[ $rc == 0 ]] || status=1
}
# One process per test: an op that aborts (a failed launch is fatal) does
# not hide the verdicts of the others.
if want ops; then
echo "== cuda_backend_test"
for t in $(.devbin/cuda_backend_test --gtest_list_tests --gtest_filter="${OPS_FILTER:-*}" |
           awk '/^[^ ]/ {suite = $1} /^  / {print suite $1}'); do
  timeout 60 .devbin/cuda_backend_test --gtest_filter="$t" >>"$out/cuda_backend_test.log" 2>&1
  rc=$?
  [[ $rc == 0 ]] && echo "ok   $t" || { echo "FAIL $t (rc $rc)"; status=1; }
done
grep -E "Failure|off; worst|cuda: |Expected|Which is" "$out/cuda_backend_test.log" | head -40
fi
want stage && step model_stage_gpu_test 90 .devbin/model_stage_gpu_test
# Two stage processes handing tensors over through CUDA IPC.
want ipc && step gpu_transport_test 90 .devbin/gpu_transport_test
if want bench; then
  for dtype in ${BENCH_DTYPES:-bf16 fp16}; do
    step zo_bench_gpu_$dtype 180 .devbin/zo-bench gpu --json --dtype "$dtype"
  done
fi
if want twin && python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
  step torch_gpu_step 120 python3 bench/torch_twin/gpt2_gpu_step.py --json
fi
if want train; then
step zo_train_gpu 120 .devbin/zo-train --device cuda --steps 30
# The training loop with an embedded server on the GPU, overflowing fp16
# steps skipped included.
step trainer_test 120 .devbin/trainer_test
fi
if want e2e; then
# The end-to-end worker tests with real zo-server processes; zo-train's
# --device auto takes the GPU: a killed GPU worker re-attaches and repeats
# the uninterrupted run's losses exactly; two stage processes over TCP.
export ZO_TRAIN_PATH=$PWD/.devbin/zo-train ZO_SERVER_PATH=$PWD/.devbin/zo-server
step zo_train_e2e 180 .devbin/zo_train_e2e_test --gtest_filter='*Killed*:*TwoStage*'
cat >/tmp/zo-overflow.json <<'JSON'
{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 2,
 "optimizer": {"type": "AdamW", "params": {"lr": 2e-3}},
 "fp16": {"enabled": true, "initial_scale_power": 30}, "steps_per_print": 1}
JSON
step zo_train_overflow 60 .devbin/zo-train --device auto --config /tmp/zo-overflow.json \
  --steps 24
fi
if want gpt2; then
# GPT-2-small shape (the synthetic text's vocabulary, not GPT-2's) with DPU
# on the embedded server: the step split compute / push / wait per step.
rm -f /tmp/zo-gpt2-metrics.jsonl
step zo_train_gpt2_dpu 180 .devbin/zo-train --device cuda \
  --config examples/configs/gpu_gpt2_bf16_dpu.json --n-layer 12 --n-embd 768 --n-head 12 \
  --block-size 1024 --steps 12 --metrics-out /tmp/zo-gpt2-metrics.jsonl
cat /tmp/zo-gpt2-metrics.jsonl >>"$out/zo_train_gpt2_dpu.log" 2>/dev/null
# The same without DPU: the server's step then shows as waiting for weights.
sed 's/"enabled": true,/"enabled": false,/' examples/configs/gpu_gpt2_bf16_dpu.json \
  >/tmp/zo-gpt2-nodpu.json
rm -f /tmp/zo-gpt2-metrics.jsonl
step zo_train_gpt2_nodpu 180 .devbin/zo-train --device cuda --config /tmp/zo-gpt2-nodpu.json \
  --n-layer 12 --n-embd 768 --n-head 12 --block-size 1024 --steps 12 \
  --metrics-out /tmp/zo-gpt2-metrics.jsonl
cat "$out/zo_train_gpt2_nodpu.log" /tmp/zo-gpt2-metrics.jsonl >>"$out/zo_train_gpt2_dpu.log"
rm -f "$out/zo_train_gpt2_nodpu.log"
fi
if want accum; then
# zo.gradient_accumulation: the GPT-2-small run (2 micro-batches of 8, DPU)
# summing its micro-batches on the GPU, then on the servers (a push per
# micro-batch, no gradient tensors kept on the GPU); nvidia-smi's peak
# memory.used beside each.
for policy in device servers; do
  sed "s/\"zo\": {/\"zo\": {\"gradient_accumulation\": \"$policy\", /" \
    examples/configs/gpu_gpt2_bf16_dpu.json >/tmp/zo-accum-$policy.json
  rm -f /tmp/zo-accum.jsonl
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 >/tmp/zo-accum-mem &
  smi=$!
  step zo_train_accum_$policy 180 .devbin/zo-train --device cuda --config /tmp/zo-accum-$policy.json \
    --n-layer 12 --n-embd 768 --n-head 12 --block-size 1024 --steps 12 \
    --metrics-out /tmp/zo-accum.jsonl
  kill $smi
  echo "peak GPU memory.used MiB: $(sort -n /tmp/zo-accum-mem | tail -1)" |
    tee -a "$out/zo_train_accum_$policy.log"
  cat /tmp/zo-accum.jsonl >>"$out/zo_train_accum_$policy.log"
done
fi
# The Python package, built for this machine's python by gpu-python-bundle.sh.
export PYTHONPATH=$PWD/.devbin/python${PYTHONPATH:+:$PYTHONPATH}
if [[ ! -d .devbin/python/zo ]] && { want pytest || want hfgpt2 || want anchors; }; then
  echo "gpu-check: no .devbin/python (deploy/gpu-python-bundle.sh): parts pytest, hfgpt2 and anchors left out"
  parts=${parts// pytest / } parts=${parts// hfgpt2 / } parts=${parts// anchors / }
fi
# zo.torch with CUDA parameters against torch.optim.AdamW fed the same gradients.
want pytest && step pytest_cuda 180 python3 -m pytest -q -p no:cacheprovider \
  python/tests/test_cuda_parameters.py
gpt2_small=(--n-layer 12 --n-embd 768 --n-head 12 --vocab 50257 --block 1024 --batch 8)
if want hfgpt2; then
  # zo.torch's OffloadOptimizer (embedded server) beside torch.optim.AdamW,
  # GPT-2 small, bf16 weights with fp32 masters against torch's fp32.
  step hf_gpt2_offload_bf16 240 python3 bench/torch_twin/hf_gpt2_offload.py --json \
    --dtype bf16 --steps 12 "${gpt2_small[@]}"
fi
if want memcheck && command -v compute-sanitizer >/dev/null; then
  step memcheck 150 compute-sanitizer --tool memcheck --error-exitcode 3 \
    .devbin/cuda_backend_test --gtest_filter='*/fp16'
fi
if want anchors; then
  if [[ -d .whl ]]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/anchors-site .whl/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/anchors-site
  fi
  # DeepSpeed's JIT build of its CPU Adam needs Python.h; carried headers
  # (pyinc/, same minor version) stand in where the python has none.
  if [[ ! -f $(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h \
        && -d .whl/pyinc ]]; then
    export CPATH=$PWD/.whl/pyinc/python3.12${CPATH:+:$CPATH}
  fi
  # DeepSpeed as its ZeRO-Offload tutorial configures it (pinned host
  # buffers, overlapped reduction, contiguous gradients); zo gets the same dict.
  step deepspeed_beside_zo_bf16 ${ANCHORS_LIMIT:-420} python3 bench/anchors/deepspeed_beside_zo.py \
    --device cuda --dtype bf16 --threads "$(nproc)" --steps 12 --warmup 4 "${gpt2_small[@]}" \
    --zo-server .devbin/zo-server --keep "$out/anchors" \
    --zero-extra '{"offload_optimizer": {"device": "cpu", "pin_memory": true},
                   "overlap_comm": true, "contiguous_gradients": true}'
  rm -f "$out/anchors/init.pt"  # the saved init and batches: 0.5 GB for GPT-2 small
fi
if want stream; then
  step zo_bench_stream ${STREAM_LIMIT:-300} .devbin/zo-bench --json --steps 10 --rounds 2 stream \
    --stream-device cuda --stream-shape 12x1024
  # The same with the streamed weights in a file (offload_param "nvme").
  mkdir -p "$out/stream-nvme"
  step zo_bench_stream_nvme ${STREAM_LIMIT:-300} .devbin/zo-bench --json --steps 10 --rounds 2 \
    stream --stream-device cuda --stream-shape 12x1024 --stream-nvme "$out/stream-nvme"
  rm -rf "$out/stream-nvme"
fi
if want largest; then
  free -g | head -2
  # shellcheck disable=SC2086  # LARGEST_FLAGS: extra zo-bench flags, word-split
  step zo_bench_gpu_largest${LARGEST_TAG:-} ${LARGEST_LIMIT:-420} .devbin/zo-bench gpu --json \
    --rows largest ${LARGEST_FLAGS:-}
fi
exit $status
