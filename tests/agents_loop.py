"""The OpenAI Agents SDK's two-tool loop that test_tools.py (chat completions model) and
test_responses_tools.py (Responses model) run against kiri serve."""
import asyncio


def run_two_tool_agent(agents, model):
    """Runs an agent with get_weather and get_time on model (an agents Model) to its end; returns
    the calls the tools saw, [(name, argument)], and the run's result."""
    agents.set_tracing_disabled(True)
    called = []

    @agents.function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(("get_weather", city))
        return f"sunny and 21 C in {city}"

    @agents.function_tool
    def get_time(zone: str) -> str:
        """The local time in a time zone."""
        called.append(("get_time", zone))
        return "18:04"

    agent = agents.Agent(
        name="helper", instructions="Answer with the tools' help.", tools=[get_weather, get_time], model=model,
        model_settings=agents.ModelSettings(tool_choice="required", temperature=0, max_tokens=96))
    result = asyncio.run(agents.Runner.run(agent, "What is the weather in Paris, and the time in Europe/Paris?",
                                           max_turns=8))
    return called, result
