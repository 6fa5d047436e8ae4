# Sourced by the scripts that run epx on GPUs (bench.sh, device_check.sh, profile_env.sh, ab_bench.sh).
# NCCL's device API needs the NCCL library at run time to be the version epx was compiled against
# (2.28.9): where PyTorch's nvidia-nccl wheel is installed, its lib/ goes first on LD_LIBRARY_PATH, and
# $nccl_wheel names the wheel's folder (empty without it). NVLink multicast stays off: epx never uses
# it, and the machines are shared.
export NCCL_NVLS_ENABLE=0
nccl_wheel=$(python3 -c "import nvidia.nccl as m; print(list(m.__path__)[0])" 2>/dev/null || true)
if [ -n "$nccl_wheel" ] && [ -d "$nccl_wheel/lib" ]; then
  export LD_LIBRARY_PATH="$nccl_wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  nccl_wheel=""
fi
