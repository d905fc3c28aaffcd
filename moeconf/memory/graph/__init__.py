"""The memory model's compute side built as the engine builds it: ggml's tensors and graph
(`ggml`), llama.cpp's graph blocks (`blocks`), one composition per architecture (`archs`), the
scheduler and the allocator (`sched`), and the glue from a placement (`model`)."""
