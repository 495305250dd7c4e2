#!/usr/bin/env bash
# CPU speed of libllminfer versus llama.cpp on the same GGUF files
# (docs/bench.md, "CPU speed versus llama.cpp").
#
#   scripts/bench-cpu.sh --full    `make bench-cpu`: SmolLM2 Q4_1/Q8_0/F16,
#                                  random Llama-3.2-1B-shaped Q4_0/Q8_0/F16 and
#                                  Gemma 3 270M Q4_K_M
#   scripts/bench-cpu.sh --quick   `make bench`: SmolLM2 Q4_1 only
#   scripts/bench-cpu.sh --gemma3  Gemma 3 270M Q4_K_M only
#   scripts/bench-cpu.sh --report FILE.jsonl   the report again from raw lines
#
# Steps: build the tools, make the models (build/bench/models/, never
# committed), make or reuse the llama-cpp-python venv (outside the tree),
# then REPS rounds; each round measures the memory bandwidth and, for every
# (model, threads), runs every engine configuration once, in an order that
# alternates between rounds. Every run is a fresh process. The report gives
# medians over the rounds and ratios ours / llama.cpp of the medians, as a
# table on stdout and JSON in build/bench/cpu.json (--quick:
# build/bench/cpu-quick.json, --gemma3: build/bench/cpu-gemma3.json); raw
# per-run lines go to the matching .jsonl.
#
# Environment:
#   LLAMA_VENV      venv with llama-cpp-python (default
#                   ~/.cache/llminfer/bench-venv; made with pip when it does not
#                   import llama_cpp; building llama.cpp takes 5-10 min)
#   LLAMA_CPP_PYTHON_VERSION   version pip installs (0.3.36)
#   BENCH_LLAMA=0   ours only (no venv needed)
#   BENCH_REPS      rounds (3)
#   BENCH_THREADS   thread counts ("1 2")
#   BENCH_BW_MB     bandwidth array size in MiB (2048)
#   BENCH_KV        KV cache type of both engines, f32 or f16 (f32)
#   BENCH_SPIN_ROUNDS  rounds that also run llama.cpp's spinning OpenMP default
#                   with 2+ threads (1; llama-pv, passive waiting, runs in all)
#   BENCH_SMOKE=1   tiny workloads, to check that the harness works
#   BUILD           build folder (build)
set -euo pipefail

MODE=quick
case "${1:-}" in
--full) MODE=full ;;
--quick | "") MODE=quick ;;
--gemma3) MODE=gemma3 ;;
--report)
    MODE=report
    REPORT_IN=$(readlink -f "${2:-/nonexistent}")
    ;;
-h | --help)
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "bench-cpu.sh: unknown argument '$1' (--quick, --full, --gemma3 or --report FILE)" >&2
    exit 1
    ;;
esac

cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
OUT=$BUILD/bench
MODELS=$OUT/models
REPS=${BENCH_REPS:-3}
THREADS=${BENCH_THREADS:-1 2}
BW_MB=${BENCH_BW_MB:-2048}
SPIN_ROUNDS=${BENCH_SPIN_ROUNDS:-1}
KV=${BENCH_KV:-f32}
BENCH_LLAMA=${BENCH_LLAMA:-1}
VENV=${LLAMA_VENV:-$HOME/.cache/llminfer/bench-venv}
LLAMA_CPP_PYTHON_VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
SMOL=models/SmolLM2-135M-Instruct.Q4_1.gguf
GEMMA3=models/gemma-3-270m-q4_k_m.gguf
case $MODE in
full) JSON=$OUT/cpu.json ;;
quick) JSON=$OUT/cpu-quick.json ;;
gemma3) JSON=$OUT/cpu-gemma3.json ;;
report)
    if [ ! -f "$REPORT_IN" ]; then
        echo "bench-cpu.sh: --report needs a .jsonl file" >&2
        exit 1
    fi
    JSON=${REPORT_IN%.jsonl}.json
    ;;
esac
RAW=${JSON%.json}.jsonl
mkdir -p "$OUT" "$MODELS"

log() { echo "bench-cpu: $*" >&2; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg | sed 's/ /, /g'; }

report() {
    python3 - "$RAW" "$JSON" <<'PY'
import json, statistics, sys

raw_path, json_path = sys.argv[1:3]
rows = [json.loads(l) for l in open(raw_path) if l.strip()]
start = next((r for r in rows if r["what"] == "start"), {})
end = next((r for r in rows if r["what"] == "end"), {})


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def best(xs):
    xs = [x for x in xs if x is not None]
    return max(xs) if xs else None


def ratio(a, b):
    return a / b if a is not None and b else None


bw = {}
for r in rows:
    if r["what"] == "bandwidth" and r["result"]:
        bw.setdefault(str(r["threads"]), []).append(r["result"])
# Per round the best pass (STREAM's convention); the floor uses the best
# round: what the hardware delivers when the other tenants leave it alone.
bandwidth = {t: {"read_gbs": best([x["read_gbs"] for x in xs]),
                 "read_gbs_median": med([x["read_gbs"] for x in xs]),
                 "read_gbs_samples": [x["read_gbs"] for x in xs],
                 "copy_gbs": best([x["copy_gbs"] for x in xs]),
                 "copy_gbs_median": med([x["copy_gbs"] for x in xs]),
                 "read_kernel": xs[0]["read_kernel"], "size_mb": xs[0]["size_mb"]}
             for t, xs in sorted(bw.items())}

models, order = {}, []
for r in rows:
    if r["what"] not in ("run", "bandwidth_ws"):
        continue
    m = r["model"]
    if m not in models:
        models[m] = {"runs": {}, "ws": []}
        order.append(m)
    if r["what"] == "bandwidth_ws":
        if r["result"]:
            models[m]["ws"].append(r["result"])
        continue
    models[m]["runs"].setdefault((r["threads"], r["variant"]), []).append(r["result"])

VARIANTS = ["ours", "ours_mmap", "llama", "llama_passive"]
LLAMAS = ("llama", "llama_passive")


def summarize(results):
    """Per metric, over the rounds: tokens per second (median, best, samples),
    tokens per CPU-second of the process (median) and the CPU share, CPU
    seconds / (wall seconds x threads) (median)."""
    ok = [x for x in results if x]
    s = {"runs": len(ok), "failed": len(results) - len(ok)}
    metrics = {}  # name -> [(tok/s, tok/cpu-s, share)]
    for x in ok:
        th = x["threads"]
        parts = [(k, x["%s_tokens" % k], x.get("%s_s" % k), x.get("%s_cpu_s" % k))
                 for k in ("pp", "tg") if "%s_tokens" % k in x]
        parts += [("batch%d" % b["n_seq"], b["n_seq"] * x["batch_steps"], b["s"],
                   b.get("cpu_s")) for b in x.get("batched", [])]
        for k, n, wall, cpu in parts:
            metrics.setdefault(k, []).append(
                (n / wall, n / cpu if cpu else None, cpu / (wall * th) if cpu else None))
    for k, vals in metrics.items():
        tps = [v[0] for v in vals]
        s[k] = {"median": med(tps), "best": best(tps), "samples": tps,
                "cpu_median": med([v[1] for v in vals]),
                "cpu_share": med([v[2] for v in vals])}
    return s


def metric(per, v, k, stat="median"):
    return per.get(v, {}).get(k, {}).get(stat)


def llama_of(per, k, stat="median"):
    """llama.cpp's figure: the better of its configurations."""
    return best([metric(per, v, k, stat) for v in LLAMAS])


report = {"mode": start.get("mode"), "started": start.get("started"),
          "wall_s": end.get("wall_s"), "git": start.get("git"),
          "host": {"cpu": start.get("cpu"), "n_cpu": start.get("n_cpu")},
          "rounds": start.get("reps"),
          "loadavg_start": start.get("loadavg"), "loadavg_end": end.get("loadavg"),
          "bandwidth": bandwidth, "models": []}
llama_info = next((x["result"] for x in rows if x.get("variant") in LLAMAS and x["result"]), None)
if llama_info:
    report["llama_cpp"] = {k: llama_info.get(k) for k in
                           ("version", "kv_type", "flash_attn", "flash_attn_log",
                            "extra_bufts", "system_info")}

table = []
for m in order:
    d = models[m]
    ours_any = next((x for xs in d["runs"].values() for x in xs
                     if x and x["engine"] == "llminfer"), None)
    info = {"name": m}
    if ours_any:
        for k in ("model", "n_params", "weight_bytes", "weight_bytes_per_token",
                  "kv_bytes_per_pos", "n_vocab", "pp_tokens", "tg_prompt", "tg_tokens",
                  "batch_prompt", "batch_steps"):
            info[k] = ours_any.get(k)
    if d["ws"]:
        info["ws_bandwidth"] = {"size_mb": d["ws"][0]["size_mb"], "threads": 2,
                                "read_gbs": best([x["read_gbs"] for x in d["ws"]]),
                                "read_gbs_median": med([x["read_gbs"] for x in d["ws"]])}
    info["threads"] = {}
    for t in sorted({k[0] for k in d["runs"]}):
        per = {v: summarize(d["runs"][(t, v)]) for v in VARIANTS if (t, v) in d["runs"]}
        keys = [k for k in ("pp", "tg") if k in per.get("ours", {})]
        keys += sorted((k for k in per.get("ours", {}) if k.startswith("batch")),
                       key=lambda k: int(k[5:]))
        entry = {"variants": per, "ratios": {}, "ratios_best": {}, "ratios_cpu": {},
                 "mmap_over_read": {}}
        for k in keys:
            entry["ratios"][k] = ratio(metric(per, "ours", k), llama_of(per, k))
            entry["ratios_best"][k] = ratio(metric(per, "ours", k, "best"),
                                            llama_of(per, k, "best"))
            entry["ratios_cpu"][k] = ratio(metric(per, "ours", k, "cpu_median"),
                                           llama_of(per, k, "cpu_median"))
            entry["mmap_over_read"][k] = ratio(metric(per, "ours_mmap", k),
                                               metric(per, "ours", k))
        if "batch1" in keys:
            entry["batched_over_single"] = {
                who: {k: ratio(f(k), f("batch1")) for k in keys if k.startswith("batch")}
                for who, f in (("ours", lambda k: metric(per, "ours", k)),
                               ("llama", lambda k: llama_of(per, k)))}
        # The floor: bytes one generated token reads / read bandwidth.
        if ours_any and info.get("tg_tokens") and "tg" in keys:
            ctx = info["tg_prompt"] + (info["tg_tokens"] + 1) / 2
            nbytes = info["weight_bytes_per_token"] + info["kv_bytes_per_pos"] * ctx
            floor = {"bytes_per_token": nbytes}
            for name, gbs in (("dram", bandwidth.get(str(t), {}).get("read_gbs")),
                              ("ws", info.get("ws_bandwidth", {}).get("read_gbs")
                               if t == 2 else None)):
                if gbs:
                    f = gbs * 1e9 / nbytes
                    floor[name] = {"read_gbs": gbs, "tok_s": f,
                                   "ours": ratio(metric(per, "ours", "tg"), f),
                                   "ours_best": ratio(metric(per, "ours", "tg", "best"), f),
                                   "ours_mmap": ratio(metric(per, "ours_mmap", "tg"), f),
                                   "llama": ratio(llama_of(per, "tg"), f),
                                   "llama_best": ratio(llama_of(per, "tg", "best"), f)}
            entry["floor"] = floor
        info["threads"][str(t)] = entry
        table.append((m, t, per, keys, entry))
    report["models"].append(info)

with open(json_path, "w") as f:
    json.dump(report, f, indent=1)
    f.write("\n")


def fmt(x, p=1):
    return "-" if x is None else ("%.*f" % (p, x))


def pct(x):
    return "-" if x is None else "%.0f%%" % (100 * x)


rounds = max((len(v) for d in models.values() for v in d["runs"].values()), default=0)
print()
print("CPU speed versus llama.cpp: %s set, %d rounds, %s s, load average %s -> %s"
      % (report["mode"], rounds, report["wall_s"], report["loadavg_start"],
         report["loadavg_end"]))
for t, b in bandwidth.items():
    print("memory bandwidth, %s thread(s), %s MiB arrays, %s loads: read %.2f GB/s (median "
          "round %.2f), copy %.2f GB/s" % (t, b["size_mb"], b["read_kernel"], b["read_gbs"],
                                          b["read_gbs_median"], b["copy_gbs"]))
print()
hdr = "%-13s %2s %-7s %8s %8s %8s %8s %6s %6s %6s %6s" % (
    "model", "t", "tok/s", "ours", "ours-map", "llama", "llama-pv", "ratio", "best", "cpu",
    "map")
print(hdr)
print("-" * len(hdr))
for m, t, per, keys, e in table:
    for k in keys:
        print("%-13s %2d %-7s %8s %8s %8s %8s %6s %6s %6s %6s" % (
            m, t, k, fmt(metric(per, "ours", k)), fmt(metric(per, "ours_mmap", k)),
            fmt(metric(per, "llama", k)), fmt(metric(per, "llama_passive", k)),
            fmt(e["ratios"][k], 2), fmt(e["ratios_best"][k], 2), fmt(e["ratios_cpu"][k], 2),
            fmt(e["mmap_over_read"][k], 2)))
print()
print("generation (tg) versus the bandwidth floor = read GB/s / bytes a token reads")
hdr = "%-13s %2s %7s %6s %6s %6s %6s %6s %6s %6s %6s %6s" % (
    "model", "t", "MB/tok", "floor", "ours", "best", "map", "llama", "best", "WS", "ours",
    "llama")
print(hdr)
print("-" * len(hdr))
for m, t, per, keys, e in table:
    fl = e.get("floor")
    if not fl:
        continue
    dr, ws = fl.get("dram", {}), fl.get("ws", {})
    print("%-13s %2d %7.1f %6s %6s %6s %6s %6s %6s %6s %6s %6s" % (
        m, t, fl["bytes_per_token"] / 1e6, fmt(dr.get("tok_s")), pct(dr.get("ours")),
        pct(dr.get("ours_best")), pct(dr.get("ours_mmap")), pct(dr.get("llama")),
        pct(dr.get("llama_best")), fmt(ws.get("tok_s")), pct(ws.get("ours")),
        pct(ws.get("llama"))))
print()
print("Medians over the rounds. ratio = ours (weights read into memory) / llama.cpp, where")
print("llama.cpp is the better of llama (OpenMP defaults) and llama-pv (OMP_WAIT_POLICY=")
print("passive, 2+ threads); best = the same ratio of each side's best round; cpu = the")
print("ratio of tokens per CPU-second of the process; map = ours mmap / ours read.")
print("floor = tokens/s at the best round's read bandwidth (DRAM-sized arrays); the")
print("fractions: median tg (best: best round) / floor. WS = the floor at the read")
print("bandwidth over arrays the size of the model file (2 threads; partly cache for")
print("small models). JSON: %s" % json_path)
PY
}
if [ "$MODE" = report ]; then
    report
    exit 0
fi

# ---- tools and models ----
# Always through make: a tool left from an older tree would measure old code.
${MAKE:-make} --no-print-directory BUILD="$BUILD" "$BUILD/llm-bench-cpu" "$BUILD/llm-quantize" >&2
[ -f "$SMOL" ] || [ "$MODE" = gemma3 ] || ${MAKE:-make} --no-print-directory model >&2
[ -f "$GEMMA3" ] || [ "$MODE" = quick ] || ${MAKE:-make} --no-print-directory model-gemma3 >&2

# "label|path|bench options" per model.
GEMMA3_SPEC="gemma3-q4_k_m|$GEMMA3|--pp 512 --tg 128 --batch 0"
case $MODE in
full) MODEL_SPECS=("smollm2-q4_1|$SMOL|--pp 512 --tg 128 --batch 1,8,32 --batch-steps 16") ;;
gemma3) MODEL_SPECS=("$GEMMA3_SPEC") ;;
*) MODEL_SPECS=("smollm2-q4_1|$SMOL|--pp 512 --tg 128 --batch 0") ;;
esac
make_model() { # path, llm-quantize arguments...
    local path=$1
    shift
    if [ ! -s "$path" ]; then
        log "writing $path"
        "$BUILD/llm-quantize" "$@" >&2
    fi
}
if [ "$MODE" = full ]; then
    for ty in Q8_0 F16; do
        p=$MODELS/SmolLM2-135M-Instruct.$ty.gguf
        make_model "$p" "$SMOL" "$p" "$ty"
        MODEL_SPECS+=("smollm2-${ty,,}|$p|--pp 512 --tg 128 --batch 1,8,32 --batch-steps 16")
    done
    for ty in Q4_0 Q8_0 F16; do
        p=$MODELS/random-llama-3.2-1b.$ty.gguf
        make_model "$p" --random llama-3.2-1b "$p" "$ty"
        MODEL_SPECS+=("llama1b-${ty,,}|$p|--pp 64 --tg 32 --batch 0")
    done
    MODEL_SPECS+=("$GEMMA3_SPEC")
fi

if [ "${BENCH_SMOKE:-0}" = 1 ]; then
    for i in "${!MODEL_SPECS[@]}"; do
        MODEL_SPECS[i]="${MODEL_SPECS[i]%|*}|--pp 32 --tg 8 --batch 1,8 --batch-steps 4"
    done
    BW_MB=256
fi

# ---- llama.cpp ----
PY=
if [ "$BENCH_LLAMA" != 0 ]; then
    if ! "$VENV/bin/python" -c 'import llama_cpp' 2>/dev/null; then
        log "making the llama-cpp-python venv in $VENV (builds llama.cpp: 5-10 minutes)"
        python3 -m venv "$VENV"
        "$VENV/bin/pip" install --quiet --upgrade pip >&2
        "$VENV/bin/pip" install "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >&2
    fi
    PY=$VENV/bin/python
    log "llama-cpp-python $("$PY" -c 'import llama_cpp; print(llama_cpp.__version__)') from $VENV"
fi

# ---- runs ----
GIT=$(git describe --always --dirty 2>/dev/null || echo unknown)
printf '{"what": "start", "mode": "%s", "started": "%s", "loadavg": [%s], "git": "%s", "cpu": "%s", "n_cpu": %d, "reps": %d, "threads": "%s", "bandwidth_mb": %d}\n' \
    "$MODE" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$(loadavg)" "$GIT" \
    "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//; s/"//g')" "$(nproc)" \
    "$REPS" "$THREADS" "$BW_MB" >"$RAW"
record() { # tag (JSON members), then the command
    local tag="$1, \"load\": [$(loadavg)]"
    shift
    local out rc=0
    out=$("$@" 2>"$OUT/.bench-cpu.err") || rc=$?
    if [ $rc -ne 0 ] || [ -z "$out" ]; then
        log "FAILED ($rc): $*"
        sed 's/^/    /' "$OUT/.bench-cpu.err" | tail -n 5 >&2
        out=null
    fi
    printf '{%s, "rc": %d, "result": %s}\n' "$tag" "$rc" "$out" >>"$RAW"
}

T0=$(date +%s)
log "$MODE set, $REPS rounds, threads: $THREADS; load average $(loadavg)"

for rep in $(seq 1 "$REPS"); do
    for t in $THREADS; do
        record "\"rep\": $rep, \"what\": \"bandwidth\", \"threads\": $t" \
            "$BUILD/llm-bench-cpu" --bandwidth -t "$t" --size-mb "$BW_MB" --seconds 1
    done
    for spec in "${MODEL_SPECS[@]}"; do
        IFS='|' read -r label path opts <<<"$spec"
        opts="$opts --kv $KV"
        # The working-set bandwidth: arrays as large as what a token reads.
        ws_mb=$(($(stat -L -c %s "$path") / 1048576 + 1))
        record "\"rep\": $rep, \"what\": \"bandwidth_ws\", \"model\": \"$label\", \"threads\": 2" \
            "$BUILD/llm-bench-cpu" --bandwidth -t 2 --size-mb "$ws_mb" --seconds 1
        for t in $THREADS; do
            variants=(ours ours_mmap)
            if [ -n "$PY" ] && [ "$t" -eq 1 ]; then
                variants+=(llama)
            elif [ -n "$PY" ]; then
                # With more than one thread llama.cpp's OpenMP workers spin at
                # every barrier; when other processes hold the cores that
                # collapses (10x and worse), so llama.cpp also runs with
                # passive waiting and the better figure counts. The spinning
                # default runs in the first SPIN_ROUNDS rounds only, without
                # batched decode, to show it without taking hours.
                variants+=(llama_passive)
                [ "$rep" -le "$SPIN_ROUNDS" ] && variants+=(llama)
            fi
            # Alternate the order between rounds (reverse on even rounds).
            if [ $((rep % 2)) -eq 0 ]; then
                rev=()
                for ((i = ${#variants[@]} - 1; i >= 0; i--)); do rev+=("${variants[i]}"); done
                variants=("${rev[@]}")
            fi
            for v in "${variants[@]}"; do
                tag="\"rep\": $rep, \"what\": \"run\", \"model\": \"$label\", \"threads\": $t, \"variant\": \"$v\""
                # shellcheck disable=SC2086
                case $v in
                ours) record "$tag" "$BUILD/llm-bench-cpu" -m "$path" -t "$t" --no-mmap $opts ;;
                ours_mmap) record "$tag" "$BUILD/llm-bench-cpu" -m "$path" -t "$t" $opts ;;
                llama)
                    if [ "$t" -gt 1 ]; then
                        record "$tag" "$PY" scripts/bench_llamacpp.py -m "$path" -t "$t" $opts \
                            --batch 0
                    else
                        record "$tag" "$PY" scripts/bench_llamacpp.py -m "$path" -t "$t" $opts
                    fi
                    ;;
                llama_passive)
                    record "$tag" env OMP_WAIT_POLICY=passive \
                        "$PY" scripts/bench_llamacpp.py -m "$path" -t "$t" $opts
                    ;;
                esac
            done
        done
        log "round $rep/$REPS: $label done ($(($(date +%s) - T0)) s, load $(loadavg))"
    done
done
printf '{"what": "end", "loadavg": [%s], "wall_s": %d}\n' "$(loadavg)" $(($(date +%s) - T0)) >>"$RAW"
rm -f "$OUT/.bench-cpu.err"
report
