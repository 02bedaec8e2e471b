from tailguard.cli import main

main()
