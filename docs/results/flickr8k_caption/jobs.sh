# Sourced by the §6c experiment scripts (scst_sweep/, mean5/, sr_pl/run.sh): resumable runs with
# "done" markers, shared job lists, waiting on another job's marker.
#   EXTRA="train.num_threads=1"  --set options added to every run (two runs side by side on 2 cores)
as_sets() { local a=""; for s in "$@"; do a="$a --set $s"; done; echo "$a"; }  # KEY=VALUE ... → --set options
extra=$(as_sets ${EXTRA:-})
run_job() {  # OUT COMMAND [ARGS...]: skipped when OUT/done exists, resumed from OUT/checkpoint.pt, log in OUT.log
  local out="$1"; shift
  [ -f "$out/done" ] && return 0
  local resume=""; [ -f "$out/checkpoint.pt" ] && resume="--resume"
  "$@" $extra $resume --out "$out" --no-progress > "$out.log" 2>&1
  touch "$out/done"
}
claim() { mkdir "$1.claim" 2>/dev/null; }  # DIR/JOB: once per job across invocations (mkdir is atomic; a failed job: rmdir its .claim)
wait_for() { while [ ! -f "$1" ]; do sleep 20; done; }  # another invocation's finished run
