# Sourced by deploy/fire-ab.sh, create-ab.sh, idle.sh and profile.sh:
# starts a fresh `tocsin dev` node or three `tocsin serve` nodes (12 shards
# unless told, as ../shared/peers/side-by-side.sh starts them) on loopback,
# waits until each is ready, and stops them on exit, removing their data
# unless AB_KEEP_DIR named where it goes. Three nodes run open
# (TOCSIN_AUTH__MODE=open) and allow webhooks to loopback unless the
# environment says otherwise; other TOCSIN_* settings reach them too.
#
#   ab_start <tocsin binary> <1|3> <name for messages> [shards]
#                  sets $ab_dir (node i's data in $ab_dir/n$i, its log in
#                  $ab_dir/n$i.log) and $ab_pids (node i's pid at index i-1)
#   ab_cpu_ticks   utime + stime of every node, in clock ticks

ab_start() {
  local tocsin="$1" nodes="$2" name="$3" shards="${4:-}" port i g http
  [ -x "$tocsin" ] || { echo "$name: no executable $tocsin" >&2; exit 2; }
  # A node of the previous run may still be shutting down: give it 15 s.
  for port in 7070 7071 7080 7081 7090 7091; do
    for _ in $(seq 150); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null || continue 2; sleep 0.1; done
    echo "$name: port $port is taken; stop what listens there first" >&2
    exit 1
  done
  if [ -n "${AB_KEEP_DIR:-}" ]; then
    ab_dir="$AB_KEEP_DIR"
    mkdir -p "$ab_dir"
  else
    ab_dir="$(mktemp -d "/tmp/tocsin-$name.XXXXXX")"
  fi
  ab_pids=()
  trap ab_cleanup EXIT
  if [ "$nodes" = 1 ]; then
    "$tocsin" dev --data "$ab_dir/n1" --grpc 127.0.0.1:7070 --http 127.0.0.1:7071 ${shards:+--shards "$shards"} \
      >"$ab_dir/n1.log" 2>&1 &
    ab_pids+=($!)
  else
    export TOCSIN_DELIVERY__WEBHOOK_ALLOW="${TOCSIN_DELIVERY__WEBHOOK_ALLOW:-127.0.0.0/8}"
    export TOCSIN_AUTH__MODE="${TOCSIN_AUTH__MODE:-open}"
    local ic="1=127.0.0.1:7070/127.0.0.1:7071,2=127.0.0.1:7080/127.0.0.1:7081,3=127.0.0.1:7090/127.0.0.1:7091"
    for i in 1 2 3; do
      g=$((7060 + 10 * i))
      "$tocsin" serve --node-id "$i" --data "$ab_dir/n$i" --grpc "127.0.0.1:$g" --http "127.0.0.1:$((g + 1))" \
        --initial-cluster "$ic" --shards "${shards:-12}" >"$ab_dir/n$i.log" 2>&1 &
      ab_pids+=($!)
    done
  fi
  for i in $(seq "$nodes"); do
    http="127.0.0.1:$((7061 + 10 * i))"
    for _ in $(seq 300); do curl -fs "http://$http/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
    curl -fs "http://$http/readyz" >/dev/null || { echo "$name: node $i never became ready (log: $ab_dir/n$i.log)" >&2; exit 1; }
  done
  # As the side-by-side script does: let the cluster's leaderships settle.
  if [ "$nodes" = 3 ]; then sleep 3; fi
}

ab_cleanup() {
  local p
  for p in "${ab_pids[@]:-}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; }; done
  wait 2>/dev/null || true
  if [ -z "${AB_KEEP_DIR:-}" ]; then rm -rf "$ab_dir"; fi
}

ab_cpu_ticks() {
  local total=0 p stat rest
  for p in "${ab_pids[@]}"; do
    stat="$(cat "/proc/$p/stat")"
    # Fields after the command name, which may hold spaces.
    rest="${stat##*) }"
    # shellcheck disable=SC2086
    set -- $rest
    total=$((total + ${12} + ${13}))
  done
  echo "$total"
}
