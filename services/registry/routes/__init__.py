"""The registry's HTTP routes, one module per resource, each with its request and response bodies."""
