"""``python -m toprcli`` (and ``torchrun -m toprcli train ...``)."""

from toprcli.cli.main import main

if __name__ == "__main__":
    main()
