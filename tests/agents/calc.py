"""A `process` agent: reads one JSON request line, answers the arithmetic in the last message
of the context's tail with one JSON line. Test helper for tests/tests/kinds.rs."""
import json
import sys

request = json.loads(sys.stdin.readline())
last = request["context"]["tail"][-1]["text"]
a, op, b = last.split()
a, b = int(a), int(b)
value = {"+": a + b, "-": a - b, "*": a * b}[op]
print(json.dumps({"text": f"= {value}", "data": {"value": value}, "schema": "calc.result.v1"}), flush=True)
