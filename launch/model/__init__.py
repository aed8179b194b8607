"""The model a run starts from: access to the Hugging Face hub (``hub``), a model's copy on the
package index, converted once into the model cache (``packaged``), the tiny text and
vision-language models built here with their tokenizer and processor (``tiny_model``,
``tiny_tokenizer``, ``tiny_processor``), choosing and checking the starting point (``prepare``),
the supervised warm start on demonstrations (``warm_start``) and episodes played with
transformers (``playback``).

Imports launch/config/ and the lower packages; nothing here starts a process of the run.
"""
