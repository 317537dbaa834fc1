"""Local protocol peers for the demo and tests: an SMTP sink and a payment-provider stub."""
