from perfdoctor.cli import main

main()
