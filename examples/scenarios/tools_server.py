"""A tool on an MCP server, built with the official Python `mcp` SDK, served over stdio:
`word_count`. The llm-tools example's `tools` participant calls it.
Run by the orchestrator (see llm-tools.yaml); needs `pip install mcp`."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("example-tools")


@server.tool()
def word_count(text: str) -> int:
    """How many words are in the text."""
    return len(text.split())


if __name__ == "__main__":
    server.run("stdio")
