from jepa_cli.cli.main import main

main()
