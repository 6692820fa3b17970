from hwlat.cli import main

main()
