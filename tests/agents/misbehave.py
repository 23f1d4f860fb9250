"""A `process` agent that misbehaves as its first argument says: `sleep` (past any deadline),
`crash` (exits with an error on stderr), `garbage` (a reply that is not JSON)."""
import sys
import time

sys.stdin.readline()
how = sys.argv[1]
if how == "sleep":
    time.sleep(600)
elif how == "crash":
    print("the calculator is on fire", file=sys.stderr, flush=True)
    sys.exit(3)
else:
    print("this is not json", flush=True)
