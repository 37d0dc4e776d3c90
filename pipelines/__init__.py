"""Tasks built on the sdk: audio front ends, speech recognition, vision, text and protein embeddings."""
