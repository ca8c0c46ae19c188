// gpualloc-hook: the Slurm scripts' compiled client of `gpualloc-slurm sync --socket`
// (built by tools/peers/build.sh into .peers/bin/; main.go says what it does).
module gpualloc.dev/examples/bridges/slurm/gpualloc-hook

go 1.24.0
