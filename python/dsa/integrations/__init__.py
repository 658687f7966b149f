"""Integrations of DSA with model libraries.

``dsa.integrations.transformers``: DSA as the attention of HF transformers' GLM-5
(``glm_moe_dsa``) and DeepSeek-V3.2 (``deepseek_v32``) models (docs/transformers.md). It needs
torch and transformers; the framework-free pieces it is built from (``_mla_math``: weight
splitting, RoPE, the cos_sin table, batch compaction, the model geometry; ``_paged``: the paged
caches and the calls to the layer step) import neither.
"""
