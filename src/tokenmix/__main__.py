from tokenmix.cli.main import main

raise SystemExit(main())
