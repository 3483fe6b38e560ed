"""What the multimodal roles share: image files (sniffing, hashing, PNG writing), the embedding cache,
the encode and image-generation wire models, and the service process that encode and diffusion
workers run in. Used by the frontend, the mocker and the SGLang worker; imports no engine."""
