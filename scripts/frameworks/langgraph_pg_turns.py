"""The scripted two-agent exchange in LangGraph 1.2 checkpointed by its PostgreSQL saver
(langgraph-checkpoint-postgres, durable: every checkpoint a committed transaction with the
server's synchronous_commit=on), against the database URL given. The same graph as
langgraph_turns.py. Prints turns/s for one conversation and for CONVERSATIONS at once (one
thread each, one saver over a pool of connections), as JSON."""
import sys

from langgraph.checkpoint.postgres import PostgresSaver
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from langgraph_turns import measure

# Connections the saver's pool holds: PostgreSQL's own default cap is 100, and the server
# serves other clients in the same run.
POOL = 32


def main(turns: int, conversations: int, url: str) -> None:
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ConnectionPool(url, min_size=1, max_size=POOL, kwargs=kwargs) as pool:
        saver = PostgresSaver(pool)
        saver.setup()
        measure(saver, turns, conversations)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
