from gpud.cli import main

main()
