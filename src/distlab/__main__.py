"""`python -m distlab ARGS` is the `distlab` command (`distlab verify ARGS` included)."""

from distlab.cli import main

if __name__ == "__main__":
    main()
