"""Local protocol peers for the demo and tests: an SMTP sink, a payment-provider stub, a chat model, an OAuth
server and an example CRM's MCP server."""
