"""The output forms of a compiled plan (command lines, env, docker, compose, llama-swap, JSON).

Named `emitting`, not `emit`: importing a subpackage sets it as an attribute of its parent, and a
subpackage `moeconf.emit` would replace the function `moeconf.emit()` once anything imported it."""
