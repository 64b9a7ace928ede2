"""Analysis of mixers through their (A, B) form; reads mixers and run directories, never trains.

    matrices      heatmaps of A, B, M per head, B-dependency graph, decay profile |M[i, i-d]|
    accounting    derived vs measured decode cache and training time, with a flag table
    expressivity  shortest information path, copy congestion and reach (framework §4.2–4.3)
    norms         spectral norms by Gram iteration vs SVD vs power iteration; Toeplitz and Neumann
                  bounds; a differentiable spectral regulariser
    report        one self-contained HTML page + Markdown from compare / bench / analyze outputs
    lm_report     the page of a language-model run: result vs baselines, curves, generations
    run_inputs    layer inputs of a trained run for a text
    outputs       output folders, JSON, tables, figures (matplotlib Agg)

CLI: ``tokenmix analyze matrix|cost|expressivity|norms`` and ``tokenmix report``.
"""
