"""RULER's synthetic tasks (Hsieh et al. 2024, arXiv 2404.06654) as a probe: one generator a task (niah, vt, cwe,
fwe), the texts apart (templates), the task configurations (tasks), one scorer (score), the readings (tables:
per task, the average, effective lengths, the needle grid and its heatmaps) and the command (probe)."""
