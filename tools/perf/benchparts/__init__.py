"""The parts of tools/perf/bench.py, one concern a file, each printing its rows into one table (table.py):

    workload.py   what each model is benchmarked on (train.py's flags), and the model and prompts they load
    machine.py    the machine's own limits at the model's shapes: matrix products (float32, bf16), memory bandwidth
    sampler.py    our sampler against model.generate, and the share of the machine's limits decoding reaches
    steps.py      seconds a step of each method through train.py, split into sampling, advantage and training; MFU
    trl_step.py   TRL's GRPOTrainer at the same setting
    llamacpp.py   llama.cpp on the model's GGUF file, for reference only
    gpu.py        --gpu: a random model of Qwen2.5-Math-1.5B's configuration, the plan against each phase's peak

torch and the heavier modules are imported inside the functions that use them, so that `bench.py --help` answers
at once."""
