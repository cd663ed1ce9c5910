"""cuaderno: durable LLM agent runs."""
