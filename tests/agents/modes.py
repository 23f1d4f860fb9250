"""A `process` agent that answers in the mode its turn asks for (`context.mode`)."""
import json
import sys

request = json.loads(sys.stdin.readline())
mode = request["context"]["mode"]
answers = {
    "converse": {"text": "process: hello"},
    "plan": {"text": "# Steps\n1. process plans"},
    "build": {"text": "built", "data": {"built": "process"}},
}
print(json.dumps(answers[mode]), flush=True)
