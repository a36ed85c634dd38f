"""Self-checks of the vLLM patches (run by ``patchkit doctor``) and the CPU stand-ins and tiny models they drive."""
