from edgefl.cli.main import run

run()
