"""The scripted two-agent exchange in LangGraph 1.2: two alternating nodes that answer with fixed
text, checkpointed by SqliteSaver (durable, like the orchestrator's log). Prints turns/s for one
conversation and for CONVERSATIONS at once (one thread each, one saver), as JSON."""
import json
import operator
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph


class State(TypedDict):
    messages: Annotated[list, operator.add]
    turn: int


def build(turns: int, saver: SqliteSaver):
    def node(name: str):
        def speak(state: State) -> dict:
            return {"messages": [f"{name} says {state['turn'] + 1}"], "turn": state["turn"] + 1}
        return speak

    def after(other: str):
        return lambda state: END if state["turn"] >= turns else other

    g = StateGraph(State)
    g.add_node("a", node("a"))
    g.add_node("b", node("b"))
    g.add_edge(START, "a")
    g.add_conditional_edges("a", after("b"))
    g.add_conditional_edges("b", after("a"))
    return g.compile(checkpointer=saver)


def conversation(app, turns: int, thread: str) -> None:
    out = app.invoke({"messages": [], "turn": 0}, {"configurable": {"thread_id": thread}, "recursion_limit": turns + 10})
    assert out["turn"] == turns, out["turn"]


def measure(saver, turns: int, conversations: int) -> None:
    """Prints turns/s through `saver` for one conversation, then for CONVERSATIONS at once
    (one thread each), as JSON."""
    app = build(turns, saver)
    t = time.perf_counter()
    conversation(app, turns, "single")
    single = turns / (time.perf_counter() - t)
    t = time.perf_counter()
    with ThreadPoolExecutor(max_workers=conversations) as pool:
        list(pool.map(lambda i: conversation(app, turns, f"t{i}"), range(conversations)))
    aggregate = turns * conversations / (time.perf_counter() - t)
    print(json.dumps({"single": single, "aggregate": aggregate}))


def main(turns: int, conversations: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        conn = sqlite3.connect(f"{d}/lg.db", check_same_thread=False)
        measure(SqliteSaver(conn), turns, conversations)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
