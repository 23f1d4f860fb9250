"""A tool on an MCP server, built with the official Python `mcp` SDK: `word_count`. The
llm-tools example's `tools` participant calls it over stdio; `tools_server.py http PORT`
serves it over streamable HTTP at http://127.0.0.1:PORT/mcp instead. Needs `pip install mcp`."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("example-tools")


@server.tool()
def word_count(text: str) -> int:
    """How many words are in the text."""
    return len(text.split())


if __name__ == "__main__":
    import sys

    if len(sys.argv) == 3 and sys.argv[1] == "http":
        print(f"listening on http://127.0.0.1:{sys.argv[2]}/mcp", flush=True)
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
