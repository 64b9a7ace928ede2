"""The paper and the comparison: the paper's facts (``paper``), the ``tokenmix compare`` pipeline
(``compare`` and its parts), the analysis suite behind ``tokenmix report PRESET``, and every preset
(``presets``). It reads run records (``runs``) and calls training and analysis; nothing below imports it.
"""
