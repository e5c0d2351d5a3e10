"""``python -m toprcli`` (and ``torchrun -m toprcli train ...``)."""

from .cli.main import main  # `python -m toprcli` is the CLI's second door (the first: the `topr` script)

if __name__ == "__main__":
    main()
