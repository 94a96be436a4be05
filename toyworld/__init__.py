"""The tiny world: a synthetic arithmetic task small enough to learn on a laptop CPU in minutes.

    tiny.py     the task, its one-token-per-character tokenizer and its ~0.8M-parameter Qwen2, warm-started here
    tasks.py    its tasks (tiny, chain), each with the grammar of its correct solutions
    credit.py   each wrong rollout's first error, and where a rule's blame ranks it

Nothing here imports the rest of the project: data.py and infra/models.py use it.
"""
