"""Alert delivery: payloads per receiver, the non-blocking dispatcher, sinks built from config."""
