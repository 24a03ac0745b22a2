// The TypeScript SDK's client against settle-mcp over Streamable HTTP (one run, JSON out).
// Usage: node client.mjs URL ; prints {"tools": [...], "balance": ..., "payment": ...}.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const client = new Client({ name: "settle-mcp-ts-test", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(process.argv[2])));
const tools = (await client.listTools()).tools.map((tool) => tool.name).sort();
const balance = await client.callTool({ name: "get_balance", arguments: { account: "acct-2" } });
const payment = await client.callTool({
  name: "send_payment",
  arguments: { idempotency_key: "ts-1", payee: "eve", amount: 25, currency: "EUR" },
});
const again = await client.callTool({
  name: "send_payment",
  arguments: { idempotency_key: "ts-1", payee: "eve", amount: 25, currency: "EUR" },
});
console.log(JSON.stringify({ tools, balance, payment, again }));
await client.close();
