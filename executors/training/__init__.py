"""Training the policy beyond one process: the megatron-core backend. `batch` (a step's turns as
padded micro-batches, shared with the Hugging Face trainer in executors/workers/trainer.py),
`qwen_megatron` (Hugging Face Qwen2/Qwen3 <-> megatron-core names and fused layouts),
`megatron_model` (the GPT model one rank holds, loaded from and exported to Hugging Face
tensors), `process_group` (joining the trainer group), `pipeline` (forward/backward across
pipeline stages), `megatron_trainer` (the GRPO update across TP x PP x DP ranks). May import
storage and rose (config, GRPO maths); never engines, co-serving, workers, scheduling, tasks or
flows.
"""
