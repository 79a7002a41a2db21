from sidecar.cli.main import main

raise SystemExit(main())
