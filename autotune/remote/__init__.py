"""Remote hosts: shells over SSH (fabric) and the service managers that run on them."""
