from moeconf.cli import run

run()
