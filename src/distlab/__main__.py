"""`python -m distlab ARGS` is the `distlab` command (`distlab verify ARGS` included)."""

if __name__ == "__main__":
    from distlab.cli import main

    main()
