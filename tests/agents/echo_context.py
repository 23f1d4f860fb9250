"""A `process` agent that answers with the context it was given, as data."""
import json
import sys

request = json.loads(sys.stdin.readline())
print(json.dumps({"text": "context", "data": request["context"]}), flush=True)
