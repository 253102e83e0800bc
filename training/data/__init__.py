"""The data path: token shards on disk (shards), the batches a step reads from them or from the synthetic task
(batches), and the writer that makes shards from text (prepare, prepare_inputs, tokenizer;
``python -m training.data.prepare``).
"""
