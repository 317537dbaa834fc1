"""Irreversible effects: the ledger (`ledger`), the adapter contract (`base`) and built-in adapters that
speak the providers' own conventions (`http`: Idempotency-Key, `smtp`: Message-ID through a standard relay,
`webhook`: Standard Webhooks signatures)."""
