# Progress of the long installs (install-vllm, install-llamacpp), sourced by them: numbered
# phases with their time, and while a long step runs a summary of its log every
# PROGRESS_EVERY seconds (default 15), all on stderr. A cached hit never gets here: it stays
# quiet. Set PROGRESS_NAME and PROGRESS_PHASES before the first phase.

# phase N TEXT: the phase starts (the previous one, if any, is said done with its time)
phase() {
    phase_end
    progress_phase=$1
    shift
    progress_text="$*"
    progress_started=$(date +%s)
    echo "$PROGRESS_NAME: $progress_text... $progress_phase/$PROGRESS_PHASES" >&2
}

# phase_end: the running phase is done, with its time (nothing when none runs)
phase_end() {
    if [ -n "${progress_phase:-}" ]; then
        echo "$PROGRESS_NAME: $progress_phase/$PROGRESS_PHASES done in" \
            "$(( $(date +%s) - progress_started )) s" >&2
        progress_phase=""
    fi
}

# pip_summary LOG: what pip's log (without --quiet) says it has done so far
pip_summary() {
    local collected downloaded installing
    collected=$(grep -c '^Collecting ' "$1" || true)
    downloaded=$(grep -c '^ *Downloading ' "$1" || true)
    installing=$(sed -n 's/^Installing collected packages: //p' "$1" | tr ',' '\n' | grep -c . || true)
    if [ "$installing" -gt 0 ]; then
        echo "pip: installing $installing packages (collected $collected, downloaded $downloaded)"
    else
        echo "pip: collected $collected packages, downloaded $downloaded"
    fi
}

# cmake_summary LOG: how far the build is, as its last "[ NN%]" line says
cmake_summary() {
    local done
    done=$(grep -o '^\[ *[0-9]*%\]' "$1" | tail -n 1 | tr -d '[] ' || true)
    echo "cmake: ${done:-0%} built"
}

# watched LOG SUMMARY CMD...: run CMD with its output appended to LOG; every PROGRESS_EVERY
# seconds (when it changed) and once at the end, print "SUMMARY LOG"; CMD's exit status
watched() {
    local log=$1 summary=$2 pid said="" now last status=0
    shift 2
    "$@" >>"$log" 2>&1 &
    pid=$!
    # stopped (timeout, kill), the install stops its step too rather than leave it running
    trap 'kill "$pid" 2>/dev/null || true; exit 143' TERM INT
    last=$(date +%s)
    while kill -0 "$pid" 2>/dev/null; do
        sleep "${PROGRESS_TICK:-1}"
        if [ $(( $(date +%s) - last )) -ge "${PROGRESS_EVERY:-15}" ]; then
            last=$(date +%s)
            now=$("$summary" "$log")
            [ "$now" = "$said" ] || echo "$PROGRESS_NAME:   $now" >&2
            said=$now
        fi
    done
    wait "$pid" || status=$?
    trap - TERM INT
    now=$("$summary" "$log")
    [ "$now" = "$said" ] || echo "$PROGRESS_NAME:   $now" >&2
    return "$status"
}
