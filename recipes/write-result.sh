#!/bin/sh
# write-result.sh TARGET COMMAND...: COMMAND's stdout into TARGET, written to TARGET.tmp and renamed
# once COMMAND succeeded (the recipes' targets appear only then, so an interrupted step never counts
# as done). TARGET.tmp is removed however COMMAND ends: a failure, or SIGHUP, SIGINT or SIGTERM to
# this shell (make passes SIGTERM on to its commands), which is passed on to COMMAND as SIGTERM
# (`jepa train` then saves its step) and waited for. COMMAND runs in the background so that the
# signal is handled at once; a background command does not see SIGINT, hence SIGTERM for every one.
target=$1
shift
tmp=$target.tmp
child=
stop() {
    trap '' HUP INT TERM
    if [ -n "$child" ]; then
        kill -TERM "$child" 2>/dev/null
        wait "$child"
    fi
    rm -f "$tmp"
    exit "$1"
}
trap 'stop 129' HUP
trap 'stop 130' INT
trap 'stop 143' TERM
"$@" > "$tmp" &
child=$!
wait "$child"
status=$?
child=
if [ "$status" -ne 0 ]; then
    rm -f "$tmp"
    exit "$status"
fi
mv "$tmp" "$target"
