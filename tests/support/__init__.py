"""What the tests share: answer checks, money checks, settings, Redis clients and set-up fixtures,
and the throwaway servers (servers, postgres, sentinel, redis_cluster) and headless browser
(browser, screenshots) they start. None of it ships in the wheel.

Test modules import from here and never from one another or from conftest. The benchmarks
import the server launchers and the graders (joins, seats) from here too.
"""
