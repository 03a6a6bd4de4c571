"""The optional pyinfra accelerator."""
